"""The fleet of models: breakers, weights, the retry budget, routes and metrics (pure)."""
