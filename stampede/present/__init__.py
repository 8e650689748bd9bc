"""What people read: the terminal report, the HTML page, the PNG figures and the progress
line, rendered from archive rows and the model's and plan's values. The top layer: it may
import results, model and checkpoint; nothing below imports it."""
