"""engine: vLLM's AsyncLLM embedded in this process, with phasespec's hooks."""
