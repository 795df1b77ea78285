"""maxtext-rl-overlay: MaxText RL's vLLM/Tunix stack, fixed in the code itself.

Pinned upstream commits are carried as git patch series (patches/<dist>/),
built into wheels with a PEP 440 local label, and published with an index and
a constraints file. Installed, `maxtext-rl-overlay verify` checks that the
distributions on the machine are those builds, with the patched files intact.

Data flows one way, one module a stage (the pins in config/, the build's
stages in stages/, verify in checks/; docs/layout.md maps the folders):
    pins -> sources -> patching -> wheels -> index/constraints -> verify
"""

__version__ = "0.1.0"
