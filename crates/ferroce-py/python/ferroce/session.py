from ._ferroce import *  # placeholder
