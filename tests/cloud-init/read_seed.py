"""Reads a seed the way the real cloud-init does and prints, as JSON, what it understood.

    read_seed.py nocloud SEED_DIR OUT_DIR   the files of a NoCloud seed (user-data, meta-data,
                                            network-config), read by cloud-init's NoCloud datasource
    read_seed.py vmware OUT_DIR             guestinfo given as VMX_GUESTINFO_* environment
                                            variables (cloud-init's own test transport), read by
                                            its VMware datasource
    read_seed.py yaml                       a YAML document on stdin, loaded by cloud-init's
                                            YAML loader (util.load_yaml); prints it as JSON

Output: {"metadata", "instance_id", "userdata", "network_config", "renames", "rendered"}: the
interfaces cloud-init renames before networking ([mac, new name, driver, device id]) and the
network configuration rendered by its netplan, eni and networkd renderers for Debian into
OUT_DIR/<renderer>/ ({"<renderer>:<path>": text}). Run with Debian's python3 and PYTHONPATH at the unpacked cloud-init package
(tests/cloud-init/install.sh); used by tests/cloud-init/support.rs.
"""

import json
import os
import shutil
import sys

from cloudinit import distros, helpers
from cloudinit.net import eni, extract_physdevs, netplan, network_state, networkd
from cloudinit.sources import DataSourceNoCloud, DataSourceVMware


def datasource(kind, work):
    paths = helpers.Paths({"cloud_dir": os.path.join(work, "cloud"), "run_dir": os.path.join(work, "run")})
    distro = distros.fetch("debian")("debian", {}, paths)
    if kind == "nocloud":
        # No device scan (fs_label None): the seed directory is the only source.
        sys_cfg = {"datasource": {"NoCloud": {"fs_label": None}}}
        return DataSourceNoCloud.DataSourceNoCloud(sys_cfg, distro, paths), distro
    return DataSourceVMware.DataSourceVMware({}, distro, paths), distro


def render(config, distro, out):
    rendered = {}
    if not config:
        return rendered
    for name, cls in (("netplan", netplan.Renderer), ("eni", eni.Renderer), ("networkd", networkd.Renderer)):
        renderer_config = dict(distro.renderer_configs.get(name, {}) or {})
        if name == "netplan":
            renderer_config["postcmds"] = False
            renderer_config["netplan_path"] = renderer_config["netplan_path"].lstrip("/")
        renderer = cls(config=renderer_config)
        state = network_state.parse_net_config_data(config, renderer=renderer)
        target = os.path.join(out, name)
        renderer.render_network_state(network_state=state, target=target)
        for root, _, files in os.walk(target):
            for f in files:
                path = os.path.join(root, f)
                with open(path) as text:
                    rendered[name + ":" + os.path.relpath(path, target)] = text.read()
    return rendered


def main():
    kind = sys.argv[1]
    if kind == "yaml":
        from cloudinit import util

        loaded = util.load_yaml(sys.stdin.read(), default=None, allowed=(dict, list))
        if loaded is None:
            sys.exit("cloud-init's YAML loader refused the document")
        json.dump(loaded, sys.stdout, default=repr)
        return
    out = sys.argv[-1]
    if kind == "nocloud":
        seed = os.path.join(out, "cloud", "seed", "nocloud")
        shutil.copytree(sys.argv[2], seed)
    ds, distro = datasource(kind, out)
    if not ds.get_data():
        sys.exit("cloud-init's %s datasource found no data" % kind)
    userdata = ds.get_userdata_raw()
    if isinstance(userdata, bytes):
        userdata = userdata.decode()
    json.dump(
        {
            "metadata": ds.metadata,
            "instance_id": ds.get_instance_id(),
            "userdata": userdata,
            "network_config": ds.network_config,
            "renames": extract_physdevs(ds.network_config) if ds.network_config else [],
            "rendered": render(ds.network_config, distro, out),
        },
        sys.stdout,
        default=repr,
    )


main()
