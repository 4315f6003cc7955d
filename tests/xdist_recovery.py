"""``--dist loadfile`` that survives a crashed worker (a pytest plugin; tests/conftest.py imports its hook).

pytest-xdist 3.8.0 (the newest release) handles a worker that dies mid-file in two wrong ways
(``LoadScopeScheduling.remove_node``):

- it puts every file the dead worker was ever given back on the queue, the finished ones too. A
  finished file is later sent as an empty batch, which never reports back, so the worker holding it is
  never given more work; near the end of a run that deadlocks the session (pytest-dev/pytest-xdist#1378,
  #1363). A CI run here hung that way, after one worker segfaulted, until its time limit.
- it sends the test that killed the worker to the replacement worker again, after reporting it as
  failed (#1371): a test that crashes the interpreter every time takes down each replacement in turn.

This scheduler requeues only what was not run, and counts the crashed test as done (xdist has already
reported it failed, with the worker's crash message). A worker runs a test only once it has the next one
or is told to stop, so a fresh replacement that was given a file of one test is given another file, or
told to stop (#1327). Everything else is xdist's.
"""

import pytest
from xdist.scheduler import LoadFileScheduling


class RecoveringLoadFileScheduling(LoadFileScheduling):
    def remove_node(self, node):
        workload = self.assigned_work.pop(node)
        pending = [nodeid for unit in workload.values() for nodeid, done in unit.items() if not done]
        if not pending:
            return None
        crashitem = pending[0]  # a worker runs its tests in the order it was sent them
        workload[self._split_scope(crashitem)][crashitem] = True
        self.workqueue.update({scope: unit for scope, unit in workload.items() if not all(unit.values())})
        for other in self.assigned_work:
            self._reschedule(other)
        return crashitem

    def _reschedule(self, node):
        super()._reschedule(node)
        if not node.shutting_down and self._pending_of(self.assigned_work[node]) == 1:
            if self.workqueue:
                self._assign_work_unit(node)
            else:
                node.shutdown()


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") == "loadfile":
        return RecoveringLoadFileScheduling(config, log)
    return None
