"""`Trainer(strategy="embark")`: the Lightning strategy over the EMBark engine."""
