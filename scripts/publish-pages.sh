#!/usr/bin/env bash
# Add a built release (the index folder scripts/build-wheels.sh wrote) to the
# Pages branch as TAG/, byte for byte, once. Used by .github/workflows/release.yml.
#
#   scripts/publish-pages.sh --dist DIR --tag TAG --site DIR [--branch gh-pages] [--push]
#
# SITE becomes a work tree (git worktree of this checkout) of BRANCH as
# fetched from origin, holding every release published so far (an empty
# orphan branch the first time). If TAG/ is already there, its wheels must be
# these bytes (SHA256SUMS identical): then nothing changes (the published
# release, constraints.txt included, is never rewritten); otherwise it fails
# and publishes nothing. --push pushes the new commit to origin BRANCH (a
# fast-forward or the branch's creation). Run it in a clone whose origin is
# the repository to publish to. Exit: 0 published or already identical, 1 not.
set -euo pipefail
dist="" tag="" site="" branch=gh-pages push=""
usage() {
  [ $# -eq 0 ] || echo "publish-pages: $*" >&2
  echo "usage: scripts/publish-pages.sh --dist DIR --tag TAG --site DIR [--branch NAME] [--push]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --dist|--tag|--site|--branch) [ $# -ge 2 ] && [ -n "$2" ] || usage "$1 needs a value" ;;
  esac
  case "$1" in
    --dist) dist=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --site) site=$2; shift 2 ;;
    --branch) branch=$2; shift 2 ;;
    --push) push=1; shift ;;
    *) usage "unknown argument '$1'" ;;
  esac
done
[ -n "$dist" ] && [ -n "$tag" ] && [ -n "$site" ] || { echo "publish-pages: --dist, --tag and --site are required" >&2; exit 2; }
fail() { echo "publish-pages: $*" >&2; exit 1; }
[[ "$tag" =~ ^v[0-9][0-9A-Za-z._-]*$ ]] || fail "tag '$tag' is not a release tag (v<version>)"

# The release must be complete and its wheels the bytes SHA256SUMS names.
for f in SHA256SUMS constraints.txt index.html simple/index.html; do
  [ -f "$dist/$f" ] || fail "$dist has no $f: give --dist the index folder scripts/build-wheels.sh made"
done
(cd "$dist" && sha256sum --check --quiet --strict SHA256SUMS) || fail "$dist: a wheel differs from its SHA256SUMS line"
[ "$(ls "$dist"/*.whl | wc -l)" = "$(wc -l < "$dist/SHA256SUMS")" ] || fail "$dist holds wheels SHA256SUMS does not list"
grep -q '^--find-links https\?://' "$dist/constraints.txt" ||
  fail "$dist/constraints.txt does not name its index by URL: build it with --base-url (the published location)"

[ ! -e "$site" ] || fail "$site exists; give a new folder"
found=0
git ls-remote --exit-code --heads origin "$branch" >/dev/null || found=$?
[ "$found" = 0 ] || [ "$found" = 2 ] || fail "cannot read origin's branches (git ls-remote exit $found)"
if [ "$found" = 0 ]; then
  git fetch --quiet origin "+refs/heads/$branch:refs/remotes/origin/$branch"
  git worktree add --quiet --detach "$site" "origin/$branch"
else
  git worktree add --quiet --detach "$site"
  git -C "$site" checkout --quiet --orphan "mrl-new-$branch"
  git -C "$site" rm -r -q -f --ignore-unmatch .
fi

if [ -e "$site/$tag" ]; then
  if cmp -s "$site/$tag/SHA256SUMS" "$dist/SHA256SUMS"; then
    cmp -s "$site/$tag/constraints.txt" "$dist/constraints.txt" ||
      echo "publish-pages: $tag: constraints.txt resolved differently now; the published one stays" >&2
    echo "publish-pages: $tag is already published with these wheels (byte-identical); nothing to publish" >&2
    exit 0
  fi
  echo "publish-pages: $tag is already published with OTHER wheels; this build did not reproduce it:" >&2
  diff "$site/$tag/SHA256SUMS" "$dist/SHA256SUMS" >&2 || true
  fail "refusing to replace a published release; fix the build's reproducibility or tag a new version"
fi

mkdir "$site/$tag"
cp -R "$dist"/. "$site/$tag"/
touch "$site/.nojekyll"
{
  printf '<!DOCTYPE html>\n<html>\n  <head><meta charset="utf-8"><title>maxtext-rl-overlay releases</title></head>\n  <body>\n'
  for d in $(cd "$site" && ls -d v*/ | sort -V -r); do
    printf '    <a href="%sconstraints.txt">%s</a><br>\n' "$d" "${d%/}"
  done
  printf '  </body>\n</html>\n'
} > "$site/index.html"
git -C "$site" add -A
git -C "$site" -c user.name="maxtext-rl-overlay release" -c user.email="release@invalid" \
  commit --quiet -m "Publish $tag" -m "$(cat "$dist/SHA256SUMS")"
echo "publish-pages: $tag added to $branch ($(git -C "$site" rev-parse --short HEAD))" >&2
if [ -n "$push" ]; then
  # A plain push: a fast-forward of the branch as fetched (or its creation),
  # so a release published concurrently is never overwritten.
  git -C "$site" push --quiet origin "HEAD:refs/heads/$branch" ||
    fail "pushing $branch failed (published concurrently?); re-run the publish job"
fi
