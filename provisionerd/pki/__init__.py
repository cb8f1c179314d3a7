"""The cluster's certificate authority, its role certificates, and where they live in a certs directory."""
