"""Tests of areal_trainer.advantage."""
