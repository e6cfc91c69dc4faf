"""Build-time tools that ``build_mar.sh`` runs: the archive's model-config YAML and its build
record. Not packed into the ``.mar``; nothing at serve time imports this package."""
