"""Train LeNet-86 once on the CPU and write data/lenet86-weights.npz + .json.

PyTorch is needed only here (pip install torch==2.13.0), never at run time: the script reads the
same images and the same network YAML as convsweep and writes the npz layout load_weights reads.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
from torch import nn

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from convsweep.inputs.data import load_dataset  # noqa: E402
from convsweep.model.network import Network, load_network, reference_forward, weight_shapes  # noqa: E402

HELD_OUT_PER_CLASS = 100


def build_model(network: Network) -> nn.Module:
    """The torch twin of a network YAML; module names match the YAML layer names."""
    modules: OrderedDict[str, nn.Module] = OrderedDict()
    for layer in network.layers:
        if layer.type == "conv2d":
            modules[layer.name] = nn.Conv2d(layer.in_shape[0], layer.out_channels, layer.kernel, layer.stride)
        elif layer.type == "relu":
            modules[layer.name] = nn.ReLU()
        elif layer.type == "maxpool2d":
            modules[layer.name] = nn.MaxPool2d(layer.size, layer.stride)
        elif layer.type == "flatten":
            modules[layer.name] = nn.Flatten()
        elif layer.type == "dense":
            modules[layer.name] = nn.Linear(layer.in_shape[0], layer.out_features)
    return nn.Sequential(modules)


def stratified_split(labels: np.ndarray, per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Hold out `per_class` images of every class, chosen by a seeded RNG; the rest trains."""
    rng = np.random.default_rng(seed)
    held_out = np.concatenate(
        [rng.choice(np.flatnonzero(labels == c), per_class, replace=False) for c in np.unique(labels)]
    )
    held_out.sort()
    train = np.setdiff1d(np.arange(len(labels)), held_out)
    return train, held_out


def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> tuple[float, np.ndarray]:
    model.eval()
    with torch.no_grad():
        predictions = torch.cat([model(images[i : i + 500]).argmax(1) for i in range(0, len(images), 500)])
    return float((predictions == labels).float().mean()), predictions.numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", type=Path, default=REPO / "networks" / "lenet86.yaml")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    network = load_network(args.network)
    dataset = load_dataset("mnist5k", image_size=network.input_shape[-1])
    train_idx, held_idx = stratified_split(dataset.labels, HELD_OUT_PER_CLASS, args.seed)
    images = torch.from_numpy(dataset.images)
    labels = torch.from_numpy(dataset.labels)

    model = build_model(network)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    loss_fn = nn.CrossEntropyLoss()
    order_rng = torch.Generator().manual_seed(args.seed)
    started = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        order = torch.from_numpy(train_idx)[torch.randperm(len(train_idx), generator=order_rng)]
        total_loss = 0.0
        for start in range(0, len(order), args.batch_size):
            batch = order[start : start + args.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(images[batch]), labels[batch])
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * len(batch)
        scheduler.step()
        held_acc, _ = accuracy(model, images[held_idx], labels[held_idx])
        print(f"epoch {epoch + 1}/{args.epochs}: loss {total_loss / len(order):.4f}, "
              f"held-out {held_acc:.4f}, {time.perf_counter() - started:.0f} s", flush=True)
    train_seconds = time.perf_counter() - started

    train_acc, _ = accuracy(model, images[train_idx], labels[train_idx])
    held_acc, held_pred = accuracy(model, images[held_idx], labels[held_idx])
    all_acc, _ = accuracy(model, images, labels)

    state = {key: value.detach().numpy().astype(network.dtype) for key, value in model.state_dict().items()}
    if set(state) != set(weight_shapes(network)):
        raise SystemExit(f"torch keys {sorted(state)} differ from the layout load_weights reads")
    weights_path = network.weights_path
    np.savez(weights_path, **state)

    # The float64 numpy reference must predict what torch predicted, or the weights are not portable.
    reference = reference_forward(network, state, dataset.images[held_idx], np.float64).argmax(1)
    mismatches = int((reference != held_pred).sum())

    report = {
        "network": str(args.network.resolve().relative_to(REPO)),
        "dataset": {"name": dataset.name, "sha256": dataset.sha256, "images": len(dataset.labels),
                    "image_size": network.input_shape[-1]},
        "split": {
            "description": f"stratified: {HELD_OUT_PER_CLASS} images per class held out, chosen with "
                           f"numpy.random.default_rng({args.seed}).choice per class (in label order); "
                           f"the other {len(train_idx)} images train",
            "train_images": len(train_idx),
            "held_out_images": len(held_idx),
            "held_out_indices": "HELD_OUT_INDICES",
        },
        "seed": args.seed,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "optimizer": f"Adam lr={args.lr}, cosine annealing to 0 over the epochs",
        "train_accuracy": round(train_acc, 4),
        "held_out_accuracy": round(held_acc, 4),
        "all_accuracy": round(all_acc, 4),
        "reference_float64_held_out_mismatches": mismatches,
        "train_seconds": round(train_seconds, 1),
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    # The 1,000 indices go on one line so the file stays readable.
    text = json.dumps(report, indent=2).replace('"HELD_OUT_INDICES"', json.dumps(held_idx.tolist()))
    weights_path.with_suffix(".json").write_text(text + "\n")
    print(f"train {train_acc:.4f}, held-out {held_acc:.4f}, all {all_acc:.4f}; "
          f"numpy float64 reference disagrees with torch on {mismatches} held-out images; "
          f"wrote {weights_path} in {train_seconds:.0f} s")


if __name__ == "__main__":
    main()
