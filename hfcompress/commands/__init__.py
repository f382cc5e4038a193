"""One module per ``hfcompress`` command (as Accelerate's ``commands/``): each adds its
parser (``<name>_command_parser``) and runs it (``<name>_command``)."""
