"""The offline corpus: where its text comes from and how its splits are built."""
