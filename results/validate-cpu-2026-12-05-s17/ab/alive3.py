import sys
sys.path.insert(0, '/work/main'); sys.path.insert(0, '/tmp/s17/mod')
from validate.launch import launch
from alivew2 import worker
def main():
    for rep in range(3):
        for before in (False, True):
            res = launch(worker, 2, (before, 3), timeout_s=300, backend="gloo")
            print('after recompute+fsdp draws' if before else 'fresh', res)
if __name__ == '__main__':
    main()
