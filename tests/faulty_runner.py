#!/usr/bin/env python3
"""A test device whose runtime is wrong on purpose: it follows the runner contract
(docs/runner-contract.md) but rewrites one chosen node of every model it is given before running
it with verify's own runner (loaded from its file, as a device would have it).

verify does not know the fault: `verify localize` has to find the node by itself. A model that
does not contain the node (another piece of a bisection) runs unchanged.

    python faulty_runner.py --fault KIND --node NAME [--node NAME2 ...] [--value V] JOB.json
    python faulty_runner.py ... --describe
    python faulty_runner.py ... --serve     (the runner contract's serve mode, fault injected)

Every node named gets the same fault (several small faults that only add up together make a
failure no single node shows). With --fused, a node whose output is a graph output is left
alone, like a bug in a fused kernel that disappears when the intermediate tensor is fetched.
With --die-on-pieces, the runner crashes (exit 9, no result) on any model verify cut into
pieces: a device lost in the middle of a localization; with --die-on-output NAME, on a model
whose graph outputs NAME (a round marking it). With --drop-piece-outputs, it leaves
the outputs of such a model out of its result: a runner that loses outputs mid-search.

KIND    what happens to node NAME                                     default V
scale   its first output is multiplied by V                           1.01
leaky   a Relu becomes LeakyRelu(alpha=V)                             0.01
weight  its weight (input 1, an initializer) is multiplied by V       1.001
bias    a BatchNormalization's bias (input 2) gets V added;           0.01
        any other op gets V added to its first output
"""

import argparse
import importlib.util
import json
import os
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                      "verify", "runner", "runner.py")
DEFAULTS = {"scale": 1.01, "leaky": 0.01, "weight": 1.001, "bias": 0.01}


def _load_runner():
    spec = importlib.util.spec_from_file_location("device_runner", RUNNER)
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    return runner


def _const(graph, name, value):
    graph.initializer.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
    return name


def _apply_to_output(graph, node, op_type, value):
    """Route node's first output through `op_type`(output, value): the node keeps its name."""
    out = node.output[0]
    node.output[0] = out + "__before_fault"
    operand = _const(graph, out + "__fault_value", value)
    graph.node.append(helper.make_node(op_type, [node.output[0], operand], [out],
                                       name=node.name + "__fault"))


def inject(model, kind, node_name, value, fused=False):
    """Rewrite `node_name` in `model` in place; False when the model has no such node (or,
    `fused`, when one of its outputs is a graph output)."""
    graph = model.graph
    # an unnamed node by verify's label for it, "<op>_<index>" (verify.graph.node_label)
    node = next((n for i, n in enumerate(graph.node) if n.name == node_name
                 or (not n.name and "%s_%d" % (n.op_type, i) == node_name)), None)
    if node is None:
        return False
    node.name = node_name  # an unnamed node keeps verify's label, so dumps name it alike
    if fused and set(node.output) & {o.name for o in graph.output}:
        return False
    if kind == "scale":
        _apply_to_output(graph, node, "Mul", value)
    elif kind == "leaky":
        if node.op_type != "Relu":
            raise SystemExit("faulty_runner: --fault leaky needs a Relu, %s is %s"
                             % (node_name, node.op_type))
        node.op_type = "LeakyRelu"
        node.attribute.append(helper.make_attribute("alpha", float(value)))
    elif kind == "weight" or (kind == "bias" and node.op_type == "BatchNormalization"):
        index = 1 if kind == "weight" else 2
        inits = {t.name: t for t in graph.initializer}
        source = inits.get(node.input[index])
        if source is None:
            raise SystemExit("faulty_runner: input %d of %s is not an initializer"
                             % (index, node_name))
        array = numpy_helper.to_array(source)
        array = array * value if kind == "weight" else array + value
        node.input[index] = _const(graph, source.name + "__faulty", array.astype(array.dtype))
    elif kind == "bias":
        _apply_to_output(graph, node, "Add", value)
    else:
        raise SystemExit("faulty_runner: unknown fault %r" % kind)
    # Nodes must stay topologically sorted: move the fault's node right after its target.
    nodes = list(graph.node)
    if nodes[-1].name == node_name + "__fault":
        extra = nodes.pop()
        nodes.insert(nodes.index(node) + 1, extra)
        del graph.node[:]
        graph.node.extend(nodes)
    return True


def main(argv):
    parser = argparse.ArgumentParser(prog="faulty_runner.py")
    parser.add_argument("--fault", required=True, choices=sorted(DEFAULTS))
    parser.add_argument("--node", required=True, action="append")
    parser.add_argument("--value", type=float, default=None)
    parser.add_argument("--fused", action="store_true")
    parser.add_argument("--die-on-pieces", action="store_true")
    parser.add_argument("--drop-piece-outputs", action="store_true")
    parser.add_argument("--die-on-output", default=None)
    args, rest = parser.parse_known_args(argv[1:])
    runner = _load_runner()
    if rest == ["--describe"]:  # it serves (below), so it says so
        info = runner.describe()
        info["serve"] = True
        print(json.dumps(info))
        return 0
    if rest == ["--serve"]:  # each job as below, in one process: the fault stays injected
        return runner.serve(sys.stdin, lambda path: run_faulty(args, runner, path))
    if len(rest) != 1:
        return runner.main([argv[0], *rest])
    return run_faulty(args, runner, rest[0])


def run_faulty(args, runner, path):
    job_path = os.path.abspath(path)
    workdir = os.path.dirname(job_path)
    with open(job_path) as fh:
        job = json.load(fh)
    model_path = job.get("model", "")
    model = onnx.load_from_string(open(os.path.join(workdir, model_path), "rb").read())
    if (args.die_on_pieces and model.producer_name == "verify-localize") or (
            args.die_on_output in {o.name for o in model.graph.output}):
        sys.stderr.write("faulty_runner: device lost\n")
        sys.stderr.flush()
        os._exit(9)  # served or not, the process ends here, without a result
    value = DEFAULTS[args.fault] if args.value is None else args.value
    hits = [inject(model, args.fault, node, value, args.fused) for node in args.node]
    if any(hits):
        faulty = os.path.join(workdir, "faulty-model.onnx")
        with open(faulty, "wb") as fh:
            fh.write(model.SerializeToString())
        job["model"] = faulty
        job_path = os.path.join(workdir, "job-faulty.json")
        with open(job_path, "w") as fh:
            json.dump(job, fh)
    status = runner.run_job_file(job_path)
    if args.drop_piece_outputs and model.producer_name == "verify-localize":
        result_path = os.path.join(workdir, job.get("result", "result.json"))
        with open(result_path) as fh:
            result = json.load(fh)
        for case in result.get("cases", []):
            case["outputs"] = {}
        with open(result_path, "w") as fh:
            json.dump(result, fh)
    return status

if __name__ == "__main__":
    sys.exit(main(sys.argv))
