"""`maxtext-rl-overlay smoke`: qualify the installed stack on the machine it is installed on."""
