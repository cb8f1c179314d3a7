"""The daemon's configuration: the loader, every problem in a document, and the one writer.

Pure apart from reading and writing the file: no trio."""
