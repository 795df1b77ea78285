"""The ground floor: what every stage of the tool uses and none owns (errors
and exit statuses, the output channel, running programs, signals, staging,
git, git object ids, digests, tables, TOML edits, JSON reading), and the
manifest: the format between the build and verify. It imports nothing of the
package outside core/."""
