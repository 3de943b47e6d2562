from types import SimpleNamespace

from deployments.ingress import replica_counts


def status(**states: int) -> SimpleNamespace:
    return SimpleNamespace(replica_states=states)


def test_stages_count_their_running_replicas_and_unknown_deployments_are_left_out():
    counts = replica_counts(
        {
            "Retriever": status(RUNNING=2, STARTING=1),
            "Generator": status(STARTING=1),
            "RagIngress": status(RUNNING=1),
            "SomethingElse": status(RUNNING=3),
        }
    )
    assert counts == {"retriever": 2, "generator": 0, "ingress": 1}


def test_the_ingress_asking_counts_itself_before_the_controller_marks_it_running():
    assert replica_counts({"RagIngress": status(STARTING=1)})["ingress"] == 1
    assert replica_counts({"RagIngress": status(RUNNING=3)})["ingress"] == 3
