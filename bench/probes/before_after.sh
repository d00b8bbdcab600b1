# A change's before and after in one device call: the tree as it is, and a copy of it with the
# files of BEFORE (a folder laid out as the repository, holding the files as they were: e.g.
# `git show REV:kernels/attention_core.py > .before/kernels/attention_core.py`) put back.
# Usage: BEFORE=.before bash THIS COMMAND...   (COMMAND runs in each tree, "$TREE" naming it:
#        before, then after; $OUT/before and $OUT/after are made for it)
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
here=$PWD; rm -rf /tmp/before_tree; mkdir -p /tmp/before_tree $OUT/before $OUT/after
tar --exclude=./.whl -cf - . | tar -xf - -C /tmp/before_tree && cp -r ${BEFORE:?}/. /tmp/before_tree/
for TREE in before after; do
  dir=$here; [ $TREE = before ] && dir=/tmp/before_tree
  echo "== $TREE"; (cd $dir && export PYTHONPATH=/tmp/site:$dir TREE && eval "$@")
done
