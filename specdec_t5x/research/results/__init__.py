"""The results/ folder: report writing, regenerating every result, headlines and the exact check."""
