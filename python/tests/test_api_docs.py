"""Every public name says what it does: a docstring on each name in ``tollgate.__all__``,
on each of their public methods and properties, and on each adapter in
``tollgate.integrations``; and the type stubs name every native class."""

import inspect
import pathlib

import tollgate


def _public_members(obj):
    for name, member in inspect.getmembers(obj):
        if name.startswith("_"):
            continue
        if callable(member) or isinstance(member, property) or inspect.isdatadescriptor(member):
            yield name, member


def test_every_public_name_and_member_has_a_docstring():
    missing = []
    for name in tollgate.__all__:
        if name == "__version__":
            continue
        obj = getattr(tollgate, name)
        if not (obj.__doc__ or "").strip():
            missing.append(name)
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for member_name, member in _public_members(obj):
                if not (getattr(member, "__doc__", None) or "").strip():
                    missing.append(f"{name}.{member_name}")
    assert missing == [], f"no docstring: {missing}"


def test_the_integrations_say_what_they_are():
    import pkgutil

    import tollgate.integrations as integrations

    assert (integrations.__doc__ or "").strip()
    for info in pkgutil.iter_modules(integrations.__path__):
        # Each adapter module needs its framework to import; its docstring is read from
        # the source, so no framework is needed here.
        source = pathlib.Path(integrations.__path__[0], f"{info.name}.py").read_text()
        assert source.lstrip().startswith(('"""', "'''")), f"{info.name} has no module docstring"


def test_the_stubs_name_every_native_class():
    stubs = pathlib.Path(tollgate.__file__).with_name("_native.pyi").read_text()
    from tollgate import _native

    for name, obj in vars(_native).items():
        if inspect.isclass(obj) and not name.startswith("_"):
            assert f"class {name}" in stubs, f"_native.pyi does not declare {name}"
    assert pathlib.Path(tollgate.__file__).with_name("py.typed").exists()
