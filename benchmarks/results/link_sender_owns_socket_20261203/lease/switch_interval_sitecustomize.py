import sys

sys.setswitchinterval(0.0005)
