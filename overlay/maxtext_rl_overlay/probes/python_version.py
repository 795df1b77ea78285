"""An interpreter's version, as it says it: prints sys.version (the build
cache keys builds by it, the build records it, the test matrix picks an
interpreter by its first two numbers).

Standard library only (see probes/__init__.py); started by path, never
imported by the tool."""

import sys

if __name__ == "__main__":
    print(sys.version)
