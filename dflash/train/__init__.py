"""DFlash drafter training: prompt sources, target responses, features, masks, loss, trainer."""
