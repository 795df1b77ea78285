"""The build's stages, in the order data flows: sources; patchfile and
patching; buildenv, wheels and overlayfiles; closures; indexpages and
publication; inputdigests and constraintsfile. run is the driver that runs
them (the build command). It imports config/, cache/, core/ and probes/
alone."""
