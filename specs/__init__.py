"""Inputs: model, plan and topology files, validated at the edge into typed records."""
