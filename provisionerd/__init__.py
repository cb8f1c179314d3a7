"""provisionerd: an elastic-capacity daemon for HPC and batch clusters."""

__version__ = "0.1.0"
