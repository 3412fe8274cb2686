"""Total energy of examples/particles for P ranks, computed independently in plain Python."""
import math
import sys

P = int(sys.argv[1])
n = sum(1000 + 7 * r for r in range(P))
c = (0.1, 0.2, 0.3)
total = 0.0
for g in range(n):
    p = (math.sin(g), math.cos(0.5 * g), 1e-3 * g)
    total += 0.5 * sum(v * v for v in p) + math.exp(-sum((v - w) ** 2 for v, w in zip(p, c)))
print("%d %.12f" % (n, total))
