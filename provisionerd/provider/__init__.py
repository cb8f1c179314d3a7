"""Provider plugins: the contract's schemas, the one-shot and persistent runtimes, and the conformance kit."""
