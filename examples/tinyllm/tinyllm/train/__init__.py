"""Training: optimizer setup, precision policy, checkpointing and the trainer loop."""
