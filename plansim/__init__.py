"""Command-line front end of plansim: the only package that imports everything."""
