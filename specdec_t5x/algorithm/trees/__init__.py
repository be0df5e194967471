"""Draft trees: their structure and compaction, their builders, exact tree acceptance."""
