"""Split data/raw/census.csv into train / val / test (4096 / 1024 / 3072 rows), standardise the numeric
columns with the training split's statistics, one-hot encode the work class, and write
data/processed/{train,val,test}.npz."""

import os

import numpy as np

raw = np.loadtxt("data/raw/census.csv", delimiter=",", skiprows=1)
numeric, work, label = raw[:, :10], raw[:, 10].astype(int), raw[:, 11]
features = np.concatenate([numeric, np.eye(4)[work]], axis=1)
mean, std = numeric[:4096].mean(0), numeric[:4096].std(0)
features[:, :10] = (numeric - mean) / std
os.makedirs("data/processed", exist_ok=True)
for name, rows in (("train", slice(0, 4096)), ("val", slice(4096, 5120)), ("test", slice(5120, None))):
    np.savez(f"data/processed/{name}.npz", x=features[rows].astype(np.float32), y=label[rows].astype(np.float32))
print("wrote data/processed/{train,val,test}.npz")
