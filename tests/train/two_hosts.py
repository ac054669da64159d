"""A plugin (CRAMLM_PLUGINS=tests.train.two_hosts) for tests: each torchrun node reports a machine of
its own (host ``node<GROUP_RANK>``), as the nodes of a real multi-node job do."""

import os

import cramlm.train.trainer as trainer

_machine = trainer.machine


def _per_node(device):
    return {**_machine(device), "host": f"node{os.environ.get('GROUP_RANK', '0')}"}


trainer.machine = _per_node
