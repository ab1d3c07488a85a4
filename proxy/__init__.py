"""proxy: phasespec's HTTP front end around vLLM's OpenAI serving layer."""
