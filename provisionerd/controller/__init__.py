"""The controller link: session, joined link, view, epoch lease, lease and fact operations, mutual-TLS connect."""
