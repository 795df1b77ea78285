"""What runs in a checkout of the project to make and test the release: the
test matrix and lint. It imports the floors below it, never the command
line."""
