import sys, stw
from validate.launch import launch
from validate.microbench import worker_threads_env
if __name__ == '__main__':
    for be in (0, 1):
        with worker_threads_env(2):
            print('barrier each' if be else 'free', launch(stw.worker, 2, (4, 8, 30.0, bool(be)), timeout_s=300, backend='gloo'), flush=True)
