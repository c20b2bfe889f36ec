"""What one pytest run is about (platform, flavour, model, configs, run directory) and the servers it boots."""
