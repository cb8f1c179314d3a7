"""The reference cluster controller: speaks the controller's wire protocol for tests, the demo and third parties.

The daemon never imports this package.
"""
