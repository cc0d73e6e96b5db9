"""Scenario files shipped with plansim (a package only so that installs carry the YAML)."""
