#!/usr/bin/env bash
# Builds a TorchServe model archive (.mar) that serves a PyG GNN from a graph. See --help.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
ARCHIVER="${ARCHIVER:-$(dirname "$PYTHON")/torch-model-archiver}"

usage() {
  cat <<'HELP'
Usage: ./build_mar.sh [options]

Builds <export-path>/<name>.mar (version 1.0) or <name>_v<version>.mar (any other version):
the serialized graph (or, with --graph-location, where it is and its checksum), the trained
(or given) weights, the handler and its model-config YAML.
With no options: the demo graph (graph_assets/demo), GraphSAGE, model_store/gnn.mar.
--task link trains a link predictor on the graph's edges; --task graph trains a graph
classifier on a directory of small graphs (no stored graph in the archive). --model-class
serves your own trained class instead, for every task.

Graph
  --graph DIR             input graph: DIR/nodes.csv + DIR/edges.csv (or .parquet), or typed
                          nodes and relations: DIR/nodes/<type>.csv +
                          DIR/edges/<src>__<relation>__<dst>.csv; format in
                          docs/graph-format.md. Default: graph_assets/demo. With --task graph:
                          a dataset of small graphs, DIR/graphs.csv + nodes.csv + edges.csv
                          (docs/graph-format.md); default: --synthetic-graphs 1000
  --synthetic-graphs N    --task graph: generate N small graphs labelled by their structure
  --synthetic NODES EDGES generate a labelled synthetic graph instead (IDs 0..NODES-1)
  --store DIR             package an existing graph store as it is (e.g. the output of
                          `python -m graph_assets.compact`, which folds live updates in)
  --graph-location DIR    keep the graph out of the archive: the archive records DIR (as an
                          absolute path) and the store's checksum, and workers map the store
                          there in place, read-only (docs/operations.md, "The graph outside
                          the archive"). Alone, DIR must hold a store (e.g. from
                          `python -m graph_assets build`); with --graph or --synthetic, the
                          store is built in DIR, which must not exist yet or be empty
  --graph-location redis://HOST:PORT/NAME
                          node and link archives: serve the graph loaded into a Redis
                          Cluster or a single Redis under prefix NAME (python -m graph_assets
                          load-redis; rediss:// for TLS; the password comes from the file
                          GNNSERVE_REDIS_PASSWORD_FILE names, never the URL). The build reads
                          --store DIR (or --graph/--synthetic; one of them is required, the
                          demo graph is never assumed) here as usual, records the URL
                          and the store's checksum, and checks the graph under NAME is that
                          store; with --precompute the build loads the rows beside the graph
                          (docs/redis-cluster.md)
  --remote-cache-mb MB    a graph in Redis: MB of fetched blocks each worker caches (default 256)
  --remote-timeout-ms MS  a graph in Redis: how long one read may wait (default 1000)
  --feature-dim N         features of a synthetic graph (default 128)
  --num-classes N         classes of a synthetic graph (default 8)
  --undirected            add the reverse of every edge (a relation between two node types
                          gets its reverse as <dst>__rev_<relation>__<src>)
  --target-node-type TYPE a typed graph: the node type the archive answers for (default: the
                          one type with a label column)
  --drop-self-loops       drop self-loops (default: kept, the graph as given)
  --drop-duplicate-edges  keep one of each set of parallel edges (default: all kept, each with
                          its own edge features)

Model
  --task TASK             node (node classification, default), link (link prediction: pair
                          scores and top-k) or graph (graph classification of inline graphs)
  --arch NAME             gcn | sage | gat | gin (default sage; gin for --task graph); on a
                          typed graph their per-relation forms, or rgcn | hgt
  --target-edge-type REL  --task link on a typed graph (required there, refused on a graph of
                          one type): the relation to predict, src__relation__dst, e.g.
                          user__buys__item; pairs are [src ID, dst ID], top-k searches the dst
                          type and exclude_neighbors leaves out the src's neighbours on REL
                          (both directions where --undirected added rev_<relation>). The graph
                          is served for the src type unless --target-node-type says otherwise
  --decoder dot|mlp       --task link: pair decoder (default dot)
  --embedding-dim N       --task link: node embedding width (default 64)
  --pooling sum|mean|max  --task graph: global pooling (default sum)
  --hidden-dim N          hidden width (default 64)
  --num-layers N          message-passing layers = sampled hops (default 2)
  --heads N               GAT attention heads (default 4)
  --epochs N              training epochs, early stopping on validation accuracy (default 200)
  --seed N                training seed (default 0)
  --weights FILE          package this state_dict (torch.save(model.state_dict(), FILE))
                          instead of training: weights you trained yourself, of a preset
                          (--arch; saved from the plain PyG model or from `python -m model
                          train`; the architecture comes from FILE's sibling model_config.json
                          if present, else from the flags) or of your own class (--model-class)

Your own model (docs/models.md; every task)
  --model-class NAME      your class: its name in --model-file, or an importable dotted path
                          such as torch_geometric.nn.models.GraphSAGE; needs --weights. PyG's
                          conventions: --task node: forward(x, edge_index[, edge_attr |
                          edge_weight]) -> one row per node; --task link: encode(x,
                          edge_index[, edge_attr | edge_weight]) -> one embedding per node
                          and decode(z, edge_label_index) -> one score per pair (GAE); on a
                          typed graph encode(x_dict, edge_index_dict[, edge_attr_dict][,
                          n_id_dict]) -> z_dict and decode(z_dict, edge_label_index), row 0
                          indexing z_dict[src], row 1 z_dict[dst] of --target-edge-type;
                          --task graph: forward(x, edge_index, batch) -> one row per graph
                          (the dataset only sizes it: nothing is trained)
  --model-file FILE       the Python file that defines the class; it goes into the archive
                          and workers import it from there (it is code: docs/security.md)
  --model-args JSON       the constructor's keyword arguments, e.g. '{"hidden": 64}'
  --model-args-file F     the same from a JSON file
  --output KIND           logits (default: answers carry softmax probabilities, the class and
                          its label; link scores are sigmoid(decode)), probabilities (rows or
                          scores taken as they are: PyG's GAE.decode returns probabilities),
                          or raw (values returned as they are: regression, risk scores)
  --num-hops K            the model's receptive field = hops sampled (default: inferred from
                          one forward, or link: one encode: the message-passing steps it
                          makes, printed; 0: a model without message passing); node and link
  --edge-input KIND       auto (default: edge_attr when forward takes it; a forward that takes
                          only edge_weight is refused on a graph with edge features: say which),
                          edge_attr, edge_weight (one edge feature) or none
  --embedding-method NAME a method of your class, called with the forward's arguments,
                          returning embeddings for return_embedding (default: node: the input
                          of the last message-passing layer the forward calls; graph: the
                          input of the last Linear layer when it sees one row per graph, else
                          none and return_embedding is refused); link embeddings are encode's

Verification (every archive)
  --verify-tolerance X    before the archive is written, its serving path runs in process and
                          is compared with the model's own answer; node: 256 random nodes and
                          the 16 highest in-degree ones with full neighbourhoods against the
                          full-graph forward; link: 256 random pairs and 32 touching those
                          hubs, and the hubs' top-10, against decode(encode(whole graph));
                          graph: 64 dataset graphs in batches of 8 against each one alone.
                          Above X the build stops naming the worst node, pair or graph and the
                          likely cause (default 1e-5)
  --no-verify             skip that check (recorded in build_info.json)

Serving (written to the archive's model-config YAML)
  --fanouts LIST          neighbours per hop, comma list, -1 = all (default 25,10,...);
                          --fanouts -1,-1 and --fanouts=-1,-1 both work; -1 at every hop gives
                          exactly the full-graph answer
  --fanouts-file F.json   a typed graph: fanouts per relation, {"user__pays__merchant": [10, 5]}
                          (PyG NeighborLoader's dict form); other relations take --fanouts
  --batch-size N          TorchServe batchSize (default 8; 16 for GPU workers)
  --max-batch-delay MS    TorchServe maxBatchDelay (default 5; 2 for GPU workers)
  --min-workers N         minWorkers and maxWorkers, given together (default: neither is
  --max-workers N         written; for GPU workers, 4 per GPU of the build machine). Written,
                          they win over a register call's initial_workers and over
                          default_workers_per_model in config.properties (1 here); unwritten,
                          initial_workers applies, else default_workers_per_model
  --response-timeout S    responseTimeout (default 60); --batch-size x --explain-budget-ms
                          must stay below it, or the build is refused
  --startup-timeout S     startupTimeout (default 300)
  --device auto|cpu|gpu   deviceType; auto = gpu when this machine has CUDA (default auto)
  --sampling-device cpu|gpu
                          GPU workers: sample on the CPU (default) or on the GPU
  --gpu-feature-fraction F
                          GPU workers: the stored features stay in GPU memory, all of them when
                          they take at most F of its free memory, else a cache of that size of
                          the rows batches read; 0 = gather from host memory (default 0.5)
  --no-cuda-graphs        GPU workers: run the forward eagerly, not as captured CUDA graphs
  --sampling-seed N       seed of the deterministic neighbour sampler (default 0)
  --max-ids N             node IDs accepted in one request (default 1024)
  --max-subgraph-nodes N  a request whose sampled ego-graph has more nodes is refused with 413
                          before any feature is gathered (default 2000000)
  --max-subgraph-edges N  the same for edges (default 20000000)
  --torch-threads N       intra-op threads per worker; 0 = one per core (default 1)
  --metrics-interval S    the batch metrics and log line sum S seconds of batches; 0 = one
                          report per batch, ~10% slower under load (default 1)
  --max-top-k N           --task link: the largest top_k a request may ask (default 1000)
  --max-graph-nodes N     --task graph: nodes of an inline graph; more is refused with 413
                          (default 10000)
  --max-graph-edges N     --task graph: the same for edges (default 100000)
  --explain-steps N       Integrated Gradients steps of an explanation (default 32)
  --explain-budget-ms MS  time budget of one explanation: fewer steps if they would not fit
                          (default 2000)
  --no-verify-checksum    workers check the graph's file sizes, meta.json and structure at
                          start but do not re-hash its files: a faster start for a large graph,
                          and a changed byte in a file is not noticed (default: re-hash)
  --precompute            compute every layer of every node at build time (layer by layer, in
                          chunks) and answer predictions, embeddings, link scores and top-k from
                          those rows: exact whatever --fanouts says, refreshed row by row by
                          live updates (node and link archives; docs/precompute.md)

Live updates (docs/dynamic-graphs.md)
  --enable-updates        accept {"op": "update"} requests carrying the update key (off by default)
  --update-state-dir DIR  where the update log lives (default: gnnserve-state in TorchServe's TEMP)
  --update-secret-file F  read the update secret from F at serve time (default: the environment
                          variable GNNSERVE_UPDATE_SECRET of the server)
  --update-follow-interval MS
                          how often each worker checks the update log and applies other workers'
                          updates between batches; 0 = only at the start of each batch (default 5)
  --min-version-wait MS   how long a prediction carrying min_graph_version may wait for this
                          worker to apply the update log up to it before a 503 (default 1000)

Archive
  --name NAME             model name (default gnn)
  --version V             model version (default 1.0)
  --export-path DIR       where the .mar goes (default model_store)
  -h, --help              this text
HELP
}

die() { echo "build_mar.sh: error: $*" >&2; exit 2; }
step() { echo "==> $*"; }

graph="$ROOT/graph_assets/demo"; store=""; synthetic=(); undirected=(); task=node; arch=""
graph_location=""; referenced=""; precompute=""; remote=""
name=gnn; version=1.0; export_path="$ROOT/model_store"; weights=""; graph_given=""
synthetic_graphs=""; model_args=(); train_args=(); synth_args=(); yaml_args=(); task_args=()
own_args=(); model_class=""; graph_args=(); verify_tolerance=1e-5; verify=1
target_edge_type=""; target_node_type=""

need() { [ $# -ge 2 ] || die "$1 needs a value (see --help)"; }
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --*=*) opt="${1%%=*}"; val="${1#*=}"; shift; set -- "$opt" "$val" "$@"; continue ;;
    --graph) need "$@"; graph="$2"; graph_given=1; shift 2 ;;
    --synthetic-graphs) need "$@"; synthetic_graphs="$2"; shift 2 ;;
    --decoder|--embedding-dim|--pooling) need "$@"; task_args+=("$1" "$2"); shift 2 ;;
    --store) need "$@"; store="$2"; shift 2 ;;
    --graph-location) need "$@"; graph_location="$2"; shift 2 ;;
    --synthetic) [ $# -ge 3 ] || die "--synthetic needs NODES EDGES"
                 synthetic=("$2" "$3"); shift 3 ;;
    --feature-dim|--num-classes) need "$@"; synth_args+=("$1" "$2"); shift 2 ;;
    --undirected) undirected=(--undirected); shift ;;
    --drop-self-loops|--drop-duplicate-edges) graph_args+=("$1"); shift ;;
    --target-node-type) need "$@"; target_node_type="$2"; graph_args+=("$1" "$2"); shift 2 ;;
    --target-edge-type) need "$@"; target_edge_type="$2"; shift 2 ;;
    --model-class) need "$@"; model_class="$2"; own_args+=("$1" "$2"); shift 2 ;;
    --model-file|--model-args|--model-args-file|--output|--num-hops|--edge-input|--embedding-method)
      need "$@"; own_args+=("$1" "$2"); shift 2 ;;
    --verify-tolerance) need "$@"; verify_tolerance="$2"; shift 2 ;;
    --no-verify) verify=""; shift ;;
    --task) need "$@"; task="$2"; shift 2 ;;
    --arch) need "$@"; arch="$2"; shift 2 ;;
    --hidden-dim|--num-layers|--heads) need "$@"; model_args+=("$1" "$2"); shift 2 ;;
    --epochs|--seed) need "$@"; train_args+=("$1" "$2"); shift 2 ;;
    --weights) need "$@"; weights="$2"; shift 2 ;;
    --fanouts|--batch-size|--max-batch-delay|--min-workers|--max-workers|--response-timeout|\
    --startup-timeout|--device|--sampling-seed|--max-ids|--max-subgraph-nodes|\
    --max-subgraph-edges|--torch-threads|--metrics-interval|--max-top-k|--max-graph-nodes|--max-graph-edges|\
    --explain-steps|--explain-budget-ms|--fanouts-file|--sampling-device|--gpu-feature-fraction)
      need "$@"; yaml_args+=("$1=$2"); shift 2 ;;
    --enable-updates|--no-verify-checksum|--no-cuda-graphs) yaml_args+=("$1"); shift ;;
    --remote-cache-mb|--remote-timeout-ms) need "$@"; yaml_args+=("$1" "$2"); shift 2 ;;
    --precompute) precompute=1; shift ;;
    --update-state-dir|--update-secret-file|--update-follow-interval|--min-version-wait)
      need "$@"; yaml_args+=("$1=$2"); shift 2 ;;
    --name) need "$@"; name="$2"; shift 2 ;;
    --version) need "$@"; version="$2"; shift 2 ;;
    --export-path) need "$@"; export_path="$2"; shift 2 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

case "$task" in
  node|link) [ -z "$synthetic_graphs" ] || die "--synthetic-graphs goes with --task graph" ;;
  graph) [ -z "$store" ] && [ ${#synthetic[@]} -eq 0 ] \
           || die "--task graph trains on small graphs: give --graph DIR or --synthetic-graphs N"
         [ -n "$graph_given" ] || synthetic_graphs="${synthetic_graphs:-1000}" ;;
  *) die "--task must be node, link or graph (got '$task')" ;;
esac
if [ -z "$arch" ]; then if [ "$task" = graph ]; then arch=gin; else arch=sage; fi; fi
relation=()
if [ "$task" = link ] && [ -z "$target_edge_type" ] && [ -n "$graph_given" ] && [ -d "$graph/nodes" ]; then
  given_relations="$(find "$graph/edges" -maxdepth 1 -type f -printf '%f\n' | sed -E 's/\.[a-z]+$//' | sort | paste -sd, | sed 's/,/, /g')"
  die "--task link on a graph of several node types predicts one relation: give --target-edge-type, one of $given_relations"
fi
if [ -n "$target_edge_type" ]; then
  [ "$task" = link ] || die "--target-edge-type goes with --task link (the relation a link archive predicts)"
  relation=(--target-edge-type "$target_edge_type")
  # A typed graph is served for the relation's source type unless told otherwise.
  if [ -z "$target_node_type" ] && [ -d "$graph/nodes" ]; then
    graph_args+=(--target-node-type "${target_edge_type%%__*}")
  fi
fi
[[ "$name" =~ ^[A-Za-z0-9][A-Za-z0-9_-]*$ ]] || die "--name must be letters, digits, '_' or '-' (got '$name')"
[[ "$version" =~ ^[0-9A-Za-z][0-9A-Za-z._-]*$ ]] || die "--version must look like 1.0 (got '$version')"
[ -x "$PYTHON" ] || die "no Python environment at $PYTHON; run 'make install' first"
[ -n "$weights" ] && { [ -f "$weights" ] || die "--weights $weights: no such file"; }
if [ -n "$model_class" ]; then
  [ -n "$weights" ] || die "--model-class needs --weights: the state_dict you trained (torch.save(model.state_dict(), F))"
  [ ${#model_args[@]} -eq 0 ] || die "--hidden-dim/--num-layers/--heads size a preset; give your class's arguments with --model-args"
  [ ${#task_args[@]} -eq 0 ] || die "${task_args[0]} configures a preset; your class decodes (link) or pools (graph) itself"
elif [ ${#own_args[@]} -gt 0 ]; then
  die "${own_args[0]} goes with --model-class (your own model class)"
fi
if [ -n "$store" ]; then [ -f "$store/meta.json" ] || die "--store $store: not a graph store (no meta.json)"
elif [ ${#synthetic[@]} -eq 0 ]; then [ -d "$graph" ] || die "--graph $graph: no such directory"; fi
if [[ "$graph_location" =~ ^rediss?:// ]]; then
  remote=1  # the build reads its local store; workers read the graph loaded into Redis
  [ "$task" != graph ] || die "--graph-location goes with --task node or link (a graph archive carries no stored graph)"
  # Else the demo graph would be trained on and refused by the checksum only at the end.
  [ -n "$store" ] || [ -n "$graph_given" ] || [ ${#synthetic[@]} -gt 0 ] \
    || die "--graph-location $graph_location needs the graph loaded there: give --store DIR, the store you loaded with python -m graph_assets load-redis (or --graph DIR / --synthetic NODES EDGES to build it again)"
fi
if [ -n "$graph_location" ] && [ -z "$remote" ]; then
  [ "$task" != graph ] || die "--graph-location goes with --task node or link (a graph archive carries no stored graph)"
  [ -z "$store" ] || die "--store copies a store into the archive; to serve $store in place, give --graph-location $store alone"
  if [ -n "$graph_given" ] || [ ${#synthetic[@]} -gt 0 ]; then
    [ ! -e "$graph_location" ] || [ -z "$(ls -A "$graph_location" 2>/dev/null)" ] \
      || die "--graph-location $graph_location is not empty: give --graph-location alone to serve the store there, or a new directory to build one in"
    mkdir -p "$graph_location"
  else
    referenced=1  # serve the store already there
    [ -f "$graph_location/meta.json" ] \
      || die "--graph-location $graph_location holds no graph store (no meta.json): build one there with --graph DIR or --synthetic NODES EDGES"
  fi
  graph_location="$(cd "$graph_location" && pwd)"
  yaml_args+=("--graph-location=$graph_location")
fi
[ -z "$precompute" ] || [ "$task" != graph ] \
  || die "--precompute goes with --task node or link (a graph archive's graphs come with each request)"
if [ "$task" = link ] && [[ " ${yaml_args[*]} " == *" --enable-updates "* ]]; then
  [ -n "$precompute" ] || die "--enable-updates on a link archive needs --precompute: top-k searches every node's embedding, which only precomputed rows keep current"
fi
mkdir -p "$export_path"
export_path="$(cd "$export_path" && pwd)"
[ "$version" = 1.0 ] && archive="$name.mar" || archive="${name}_v${version}.mar"

work="$(mktemp -d "${TMPDIR:-/tmp}/gnnserve-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
stage="$work/stage"
mkdir -p "$stage" "$work/out"
cd "$ROOT"

# The store the model is trained from: the archive's graph/, or the one it references.
graph_store="${graph_location:-$stage/graph}"
if [ -n "$remote" ]; then
  graph_store="${store:-$work/graph}"  # read here, never packed: workers read Redis
  yaml_args+=("--graph-location=$graph_location" "--graph-store=$graph_store")
fi
graph_meta="$graph_store"
if [ "$task" = graph ]; then
  graph_meta="$work/dataset"  # training data only: a graph archive carries no graph
  if [ -n "$synthetic_graphs" ]; then
    step "1/5 generating $synthetic_graphs small labelled graphs"
    "$PYTHON" -m graph_assets synthetic-graphs "$synthetic_graphs" --out "$graph_meta" \
      "${synth_args[@]}"
  else
    step "1/5 reading the graph dataset in $graph"
    "$PYTHON" -m graph_assets graphs --dataset "$graph" --out "$graph_meta" "${undirected[@]}" \
      "${graph_args[@]}"
  fi
elif [ -n "$store" ] || [ -n "$referenced" ]; then
  if [ -n "$store" ] && [ -z "$remote" ]; then cp -R "$store" "$graph_store"; fi
  step "1/5 checking the graph store ${store:-$graph_store}"
  "$PYTHON" -c 'import sys; from pathlib import Path; from graph_assets import open_store; s = open_store(Path(sys.argv[1])); print(f"  {s.num_nodes} nodes, {s.num_edges} edges, checksum {s.checksum}")' "$graph_store"
elif [ ${#synthetic[@]} -gt 0 ]; then
  step "1/5 generating a synthetic graph: ${synthetic[0]} nodes, ${synthetic[1]} edges"
  "$PYTHON" -m graph_assets synthetic "${synthetic[@]}" --out "$graph_store" "${synth_args[@]}"
else
  step "1/5 serializing the graph in $graph"
  "$PYTHON" -m graph_assets build --graph "$graph" --out "$graph_store" "${undirected[@]}" \
    "${graph_args[@]}"
fi

if [ -n "$model_class" ]; then
  step "2/5 packaging your $task model $model_class with the weights $weights"
  source=(--store "$graph_store"); [ "$task" != graph ] || source=(--dataset "$graph_meta")
  "$PYTHON" -m archive_build.own_model --task "$task" "${source[@]}" --weights "$weights" \
    --out "$work/model" "${own_args[@]}" "${relation[@]}" || exit 1
  if [ -d "$work/model/user_model" ]; then cp -R "$work/model/user_model" "$stage/"; fi
  if [ "$task" = link ]; then cp -R "$work/model/link" "$stage/link"; fi
  if [ "$task" = graph ]; then cp "$work/model/classes.json" "$stage/"; fi
elif [ "$task" != node ]; then
  source=(--store "$graph_store"); given=(); action=training
  if [ "$task" = graph ]; then source=(--dataset "$graph_meta"); fi
  if [ -n "$weights" ]; then given=(--weights "$weights"); action=packaging; fi
  step "2/5 $action a $arch $task model"
  "$PYTHON" -m model "$task" "${source[@]}" --arch "$arch" --out "$work/model" "${given[@]}" \
    "${model_args[@]}" "${task_args[@]}" "${train_args[@]}" "${relation[@]}"
  if [ "$task" = link ]; then cp -R "$work/model/link" "$stage/link"; fi
  if [ "$task" = graph ]; then cp "$work/model/classes.json" "$stage/"; fi
elif [ -n "$weights" ]; then
  step "2/5 packaging the given weights $weights"
  "$PYTHON" -m model package --store "$graph_store" --weights "$weights" --arch "$arch" \
    --out "$work/model" "${model_args[@]}"
else
  step "2/5 training a $arch node classifier"
  "$PYTHON" -m model train --store "$graph_store" --arch "$arch" --out "$work/model" \
    "${model_args[@]}" "${train_args[@]}"
fi
cp "$work/model/model_config.json" "$work/model/metrics.json" "$stage/"
if [ -n "$precompute" ]; then
  step "2/5 precomputing the rows every answer reads"
  if [ -n "$remote" ]; then
    # The rows go beside the graph in Redis; the archive keeps their meta.json, which workers
    # compare with the rows' record there.
    precomputed="$work/precomputed"
    "$PYTHON" -m model precompute --store "$graph_store" --model-dir "$work/model" \
      --out "$precomputed" --load-to "$graph_location" || exit 1
    mkdir -p "$stage/precomputed"
    cp "$precomputed/meta.json" "$stage/precomputed/"
  else
    precomputed="$stage/precomputed"
    "$PYTHON" -m model precompute --store "$graph_store" --model-dir "$work/model" \
      --out "$precomputed"
  fi
fi

step "3/5 writing the model-config YAML and staging the code"
"$PYTHON" -m archive_build.archive_config --out "$work/model-config.yaml" --task "$task" \
  --model-config "$stage/model_config.json" "${yaml_args[@]}"
if [ -n "$verify" ]; then
  if [ "$task" = graph ]; then
    step "4/5 verifying that graphs answered in a batch get their answers alone"
    checked=(--dataset "$graph_meta")
  else
    step "4/5 verifying the serving path against the model's full-graph forward"
    checked=(--store "$graph_store")
    if [ -n "$precompute" ]; then checked+=(--precomputed "$precomputed"); fi
  fi
  "$PYTHON" -m archive_build.verify "${checked[@]}" --model-dir "$work/model" \
    --model-config-yaml "$work/model-config.yaml" --tolerance "$verify_tolerance" \
    --out "$work/verification.json" || exit 1
  cp "$work/model/model_config.json" "$stage/"  # the check may have recorded boundary degrees
  verification=(--verification "$work/verification.json")
else
  echo "  verification skipped (--no-verify); recorded in build_info.json"
  verification=(--verification none)
fi
"$PYTHON" -m archive_build.build_info --name "$name" --version "$version" --graph "$graph_meta" \
  --metrics "$stage/metrics.json" --model-config "$stage/model_config.json" \
  "${verification[@]}" --out "$stage/build_info.json"
# Every module of the three serving packages, subpackages included (never __pycache__ or data);
# archive_build/ runs here only and stays out of the archive.
for package in graph_assets model handler; do
  find "$package" -name '*.py' -not -path '*/__pycache__/*' -exec cp --parents {} "$stage/" \;
done

step "5/5 packaging $archive with torch-model-archiver"
"$ARCHIVER" --model-name "$name" --version "$version" --handler handler/gnn_handler.py \
  --serialized-file "$work/model/model.pt" --extra-files "$stage" \
  --config-file "$work/model-config.yaml" --export-path "$work/out" --force
mv -f "$work/out/$name.mar" "$export_path/$archive"
echo "built $export_path/$archive ($(du -h "$export_path/$archive" | cut -f1))"
if [ -n "$remote" ]; then
  echo "its graph is not inside: workers read it from $graph_location"
elif [ -n "$graph_location" ]; then
  echo "its graph is not inside: workers map the store at $graph_location, read-only"
fi
