"""The configuration catalog: axes, named configs, flavours (how a config becomes env vars and flags), kernel expectations and their recorded verifications."""
