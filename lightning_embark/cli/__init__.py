"""The command-line tools, one module per command (``embark-plan`` is :mod:`.embark_plan`)."""
