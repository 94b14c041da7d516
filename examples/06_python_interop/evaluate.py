"""Python's half of examples/06_python_interop: opens the checkpoint loom wrote with stock
torch.load (weights_only=True, no allowlist, no loom code), loads the weights into a
torch.nn.Sequential and evaluates it on Fashion-MNIST's test set.

Usage: python evaluate.py CHECKPOINT DATA_DIR     (DATA_DIR: the unpacked IDX files)
Exits 1 unless Python predicts, for every test image, the class the C++ side predicted (the
checkpoint's test_predictions, in the file's order), and so counts the same correct ones.
"""

import sys
from pathlib import Path

import torch


def idx(path, offset):
    return torch.frombuffer(bytearray(Path(path).read_bytes()[offset:]), dtype=torch.uint8)


def main(checkpoint, data):
    ck = torch.load(checkpoint)
    print(f"Python: {checkpoint} holds {list(ck)}; trained {ck['step']} steps under "
          f"{ck['runtime']['precision']}; Adam state for {len(ck['optimizer']['state'])} tensors")
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10))
    model.load_state_dict(ck["model"])
    # The optimizer state loads into torch.optim too: training could go on here.
    torch.optim.Adam(model.parameters()).load_state_dict(ck["optimizer"])
    model.eval()
    images = idx(f"{data}/t10k-images-idx3-ubyte", 16).view(-1, 1, 28, 28).float() / 255
    labels = idx(f"{data}/t10k-labels-idx1-ubyte", 8).long()
    images = (images - 0.2860) / 0.3530  # what the C++ side's Normalize did
    with torch.no_grad():
        predicted = torch.cat([model(images[i:i + 1000]).argmax(1)
                               for i in range(0, len(labels), 1000)])
    correct = int((predicted == labels).sum())
    accuracy = correct / len(labels)
    theirs = ck["test_predictions"]  # the class C++ predicted for each image, in file order
    if theirs.shape != predicted.shape:
        print(f"Python: C++ saved {tuple(theirs.shape)} predictions for {len(labels)} test images")
        return 1
    theirs_correct = int((theirs == labels).sum())
    if theirs_correct != ck["test_correct"]:
        print(f"Python: C++'s saved predictions get {theirs_correct} images right, but it says "
              f"test_correct {ck['test_correct']}")
        return 1
    same = torch.equal(predicted, theirs) and correct == ck["test_correct"]
    if not same:
        differ = int((predicted != theirs).sum())
        print(f"Python: {differ} of {len(labels)} test images predicted differently from C++ "
              f"(first at {(predicted != theirs).nonzero()[:5].flatten().tolist()}); "
              f"{correct} correct here, {ck['test_correct']} in C++")
    print(f"Python: test accuracy {100 * accuracy:.2f}% ({correct} of {len(labels)}); C++ measured "
          f"{100 * ck['test_accuracy']:.2f}%, and predicted the same class for "
          f"{int((predicted == theirs).sum())} of {len(labels)} images: "
          f"{'the same' if same else 'DIFFERENT'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
