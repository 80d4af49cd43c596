"""What a launch costs on a device, as data: the cost table (measured or predicted) and the
roofline model that predicts it for catalog SKUs that are not present. Pure Python; both
``profile`` (which measures tables) and ``plan`` (which reads them) import it.
"""
