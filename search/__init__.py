"""The Optuna study that refines greedy plans, installed as ``lightning_embark.search``."""
