"""Distributed memory: partitioning, layered halos, local numbering and halo exchanges."""
