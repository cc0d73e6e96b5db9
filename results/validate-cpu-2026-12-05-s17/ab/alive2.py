import sys
sys.path.insert(0, '/work/main'); sys.path.insert(0, '/tmp/s17/mod')
from validate.launch import launch
from alivew import worker
def main():
    for rep in range(2):
        for layers, mbs, depths in [(3, 12, (1, 3, 6, 12)), (3, 12, (1, 12))]:
            res = launch(worker, 2, (layers, mbs, depths, 3), timeout_s=300, backend="gloo")
            print(layers, mbs, depths, [[round(x, 3) for x in r] for rr in res for r in rr])
if __name__ == '__main__':
    main()
