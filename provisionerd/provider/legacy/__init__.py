"""Legacy mode: unmodified LSF resource-connector plugins behind our provider interface."""
