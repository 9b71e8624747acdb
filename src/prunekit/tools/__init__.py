"""What sits on top of the library: the command line and the demo."""
