"""The suite's pytest fixtures, registered by the plugin only while a
target is active (verification/plugin.py)."""

import pytest

RUN_PLUGIN = "gdn_verify_suite"     # the name the plugin registers its SuiteRun under


@pytest.fixture(scope="session")
def gdn_target(request):
    """The implementation under test (--gdn-target / GDN_TARGET / ini gdn_target)."""
    return request.config.pluginmanager.get_plugin(RUN_PLUGIN).target
