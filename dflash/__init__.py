"""DFlash: block-diffusion speculative decoding (drafter, verification, reference loop)."""
