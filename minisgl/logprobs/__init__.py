"""Log-probabilities of sampled tokens and of prompt tokens: the math (``score.py``) and the feature that
asks the forward pass for them (``feature.py``); the server's formats for them are ``minisgl/server``'s."""
