"""Measuring decodes: speed, acceptance, loop efficiency, named experiments, reference decoders."""
