"""Programs users run: llm.py (`fusegrad-llm chat|serve`)."""
